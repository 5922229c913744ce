"""The Python test program of tests/test_prof_python.py: a loop nest and a helper.
Lines matter: the test looks for them."""


def helper(x):
    return (x * 31 + 7) % 1009  # line 6


def work(n):
    total = 0
    for i in range(n):  # line 11: outer loop
        for j in range(300):  # line 12: inner loop
            total += helper(i + j)  # line 13
    return total


if __name__ == "__main__":
    import sys
    print(work(int(sys.argv[1]) if len(sys.argv) > 1 else 1500))
