/* agent.c: the in-sandbox agent; written next. */
int main(void) { return 0; }
