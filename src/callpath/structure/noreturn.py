"""Functions that never return: a call to one ends its basic block with no fall-through edge.

Without this, the bytes after ``call abort`` (often the start of unrelated code, or padding)
would be treated as reachable, and a loop could appear to continue through an error exit.
The list holds the C library, C++ runtime and Fortran runtime functions that gcc and clang mark
``noreturn``; DWARF's ``DW_AT_noreturn`` adds the module's own.
"""

from __future__ import annotations

NO_RETURN = frozenset({
    "abort", "exit", "_exit", "_Exit", "quick_exit", "__assert_fail", "__assert_perror_fail",
    "__assert", "__stack_chk_fail", "__chk_fail", "__fortify_fail", "__libc_fatal",
    "__cxa_throw", "__cxa_rethrow", "__cxa_bad_cast", "__cxa_bad_typeid",
    "__cxa_throw_bad_array_new_length", "__cxa_pure_virtual", "__cxa_call_unexpected",
    "_Unwind_Resume", "longjmp", "_longjmp", "siglongjmp", "__longjmp_chk", "pthread_exit",
    "err", "errx", "verr", "verrx", "error_exit", "_gfortran_stop_string",
    "_gfortran_error_stop_string", "_gfortran_runtime_error", "_gfortran_runtime_error_at",
    "_gfortran_os_error", "_gfortran_generate_error", "__ubsan_handle_builtin_unreachable",
    "_ZSt9terminatev", "_ZSt17__throw_bad_allocv", "_ZSt20__throw_length_errorPKc",
    "_ZSt24__throw_out_of_range_fmtPKcz", "_ZSt20__throw_out_of_rangePKc",
    "_ZSt19__throw_logic_errorPKc", "_ZSt25__throw_bad_function_callv",
    "_ZSt16__throw_bad_castv", "_Py_FatalErrorFunc", "Py_FatalError", "_Py_FatalErrorFormat",
    "Py_Exit", "__libc_start_main", "__libc_start_call_main",
})


def is_no_return(link_name: str, extra: frozenset[str] | set[str] = frozenset()) -> bool:
    """Whether a call to the procedure named ``link_name`` (``x@plt`` counts as ``x``) never
    returns."""
    base = link_name[:-4] if link_name.endswith("@plt") else link_name
    return base in NO_RETURN or base in extra
