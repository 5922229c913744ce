/* A tiny shared library: calls into it go through the caller's PLT. */
int plt_step(int x) { return x * 3 + 1; }
