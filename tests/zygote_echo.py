"""A child for tests/test_zygote.py: echoes each line of stdin until EOF."""
import sys

for line in sys.stdin:
    print("echo " + line.strip())
