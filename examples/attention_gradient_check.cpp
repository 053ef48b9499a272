// Placeholder until the CPU reference lands (issue 2).
int main() { return 0; }
