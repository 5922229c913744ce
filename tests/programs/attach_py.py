"""A Python program for `callpath run --pid` and `callpath dump --pid`: one thread compresses
in zlib (a C extension call) in a loop, one waits on a lock held by the main thread, and the
main thread sleeps in time.sleep until the file argv[1] exists; then it prints "done", exits 0."""
import os
import sys
import threading
import time
import zlib

lock = threading.Lock()
stop = False


def waiter() -> None:
    with lock:  # LOCK_LINE
        pass


def compressor() -> None:
    data = bytes(range(256)) * 2000
    while not stop:
        zlib.compress(data, 9)  # COMPRESS_LINE


def main() -> None:
    global stop
    lock.acquire()
    threads = [threading.Thread(target=waiter), threading.Thread(target=compressor)]
    for t in threads:
        t.start()
    print("ready", flush=True)
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.2)  # SLEEP_LINE
    stop = True
    lock.release()
    for t in threads:
        t.join()
    print("done", flush=True)


main()
