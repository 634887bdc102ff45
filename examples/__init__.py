"""The example scripts, run as files (`python examples/main_job.py`), and `common.py`, what they share."""
