#include <cstdio>
int main() { std::puts("gptoss"); return 0; }
