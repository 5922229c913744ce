"""A small CPU-bound Python program for the measurement-directory structure test."""


def work(n):
    t = 0
    for i in range(n):  # LOOP_WORK
        t += i * i  # INNER
    return t


total = 0
for _k in range(20):
    total += work(100000)
print(total)
