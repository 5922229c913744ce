#include <stdio.h>
static volatile double sink;
__attribute__((noinline)) static void leaf(int n) { for (int i = 0; i < n; i++) sink += i * 0.5; }
__attribute__((noinline)) static void middle(int n) { leaf(n); leaf(n / 2); }
int main(void) { for (int k = 0; k < 400; k++) middle(200000); printf("%f\n", sink); return 0; }
