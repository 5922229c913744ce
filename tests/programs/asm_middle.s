# Hand-written routines without any call-frame information (no .cfi directives), called in
# the middle of the call chain of asm_chain.c: the unwinder can only get through them with
# unwind recipes computed from their instructions.
#
#   asm_fp(n, fn):   frame pointer, two pushed registers, the stack aligned to 32 bytes
#                    (and rsp, -32) and a local area; spins n rounds itself, then calls fn(n)
#   asm_nofp(n, fn): no frame pointer: one push and sub rsp; spins, then calls fn(n)
#   asm_badcfi(n, fn): like asm_nofp but with *wrong* CFI, as glibc's __mpn_addmul_1 has:
#                    the directives never mention its pushes nor its sub rsp, so CFI looks
#                    for the return address at rsp, where this routine keeps n (no code
#                    address): CFI is demonstrably wrong there and the recipe is used
        .text
        .globl  asm_fp
        .type   asm_fp, @function
asm_fp:
        push    %rbp
        mov     %rsp, %rbp
        push    %rbx
        push    %r12
        and     $-32, %rsp
        sub     $64, %rsp
        mov     %rdi, %rbx
        mov     %rsi, %r12
        mov     %rdi, %rcx
        imul    $2000, %rcx, %rcx
1:      mov     %rcx, 8(%rsp)
        dec     %rcx
        jnz     1b
        mov     %rbx, %rdi
        call    *%r12
        lea     -16(%rbp), %rsp
        pop     %r12
        pop     %rbx
        pop     %rbp
        ret
        .size   asm_fp, .-asm_fp

        .globl  asm_nofp
        .type   asm_nofp, @function
asm_nofp:
        push    %rbx
        sub     $32, %rsp
        mov     %rdi, %rbx
        mov     %rsi, 16(%rsp)
        mov     %rdi, %rcx
        imul    $2000, %rcx, %rcx
2:      mov     %rcx, 8(%rsp)
        dec     %rcx
        jnz     2b
        mov     %rbx, %rdi
        call    *16(%rsp)
        add     $32, %rsp
        pop     %rbx
        ret
        .size   asm_nofp, .-asm_nofp

        .globl  asm_badcfi
        .type   asm_badcfi, @function
asm_badcfi:
        .cfi_startproc
        push    %rbx
        push    %r12
        sub     $24, %rsp
        mov     %rdi, %rbx
        mov     %rsi, %r12
        mov     %rdi, (%rsp)
        mov     %rdi, %rcx
        imul    $2000, %rcx, %rcx
3:      mov     %rcx, 8(%rsp)
        dec     %rcx
        jnz     3b
        mov     %rbx, %rdi
        call    *%r12
        add     $24, %rsp
        pop     %r12
        pop     %rbx
        ret
        .cfi_endproc
        .size   asm_badcfi, .-asm_badcfi
        .section .note.GNU-stack,"",@progbits
