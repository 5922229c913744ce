/* A dense switch inside a loop: gcc -O2 compiles it to a jump table (an indirect jump) with
 * no bounds check (all 16 values are cases), so the loop around it is found only if the table
 * is resolved. The markers name the expected lines. */
#include <stdio.h>
#include <stdlib.h>

volatile long sink;

__attribute__((noinline)) long interpret(const unsigned char *code, int n, long acc)
{
    for (int pc = 0; pc < n; pc++) { /* LOOP_PC */
        switch (code[pc] & 15) { /* SWITCH */
        case 0: acc += 3; break;
        case 1: acc *= 5; break; /* CASE_MUL */
        case 2: acc -= code[pc] * 7; break;
        case 3: acc ^= 0x5a5a; break;
        case 4: acc = acc / 3 + 1; break;
        case 5: acc <<= 1; break;
        case 6: acc = -acc; break;
        case 7: acc += sink; break;
        case 8: acc %= 1000003; break;
        case 9: acc = acc * acc + 11; break; /* CASE_SQUARE */
        case 10: acc += pc; break;
        case 11: acc |= 1; break;
        case 12: acc &= 0xffffff; break;
        case 13: acc -= pc * 3; break;
        case 14: acc >>= 2; break;
        case 15: acc--; break; /* every value goes through the table: no bounds check */
        }
    }
    return acc;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    unsigned char *code = malloc((size_t)n);
    if (!code)
        return 1;
    for (int i = 0; i < n; i++)
        code[i] = (unsigned char)((i * 7) % 12);
    printf("%ld\n", interpret(code, n, 1));
    free(code);
    return 0;
}
