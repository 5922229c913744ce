"""A numpy matrix product (BLAS) and a pure-Python loop."""
import numpy as np

a = np.random.default_rng(1).random((500, 500))
b = np.random.default_rng(2).random((500, 500))


def product() -> float:
    s = 0.0
    for _ in range(30):
        s += float((a @ b)[0, 0])
    return s


def python_loop() -> int:
    t = 0
    for i in range(300_000):
        t += i % 7
    return t


product()
python_loop()
