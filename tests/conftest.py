import os

# Verify the IR between every compiler stage during tests.
os.environ.setdefault("GRADC_VERIFY", "1")
