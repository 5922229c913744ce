/* the body of included.c's loop: statements of this file inside a procedure of that one */
acc += i * 0.5;
if (acc > 1e9)
    acc = 0;
