def leaf(n):
    s = 0
    for i in range(n):
        s += i * i
    return s

def middle():
    return leaf(200000) + leaf(100000)

def main():
    t = 0
    for _ in range(60):
        t += middle()
    print(t)

main()
