"""The stall watchdog: following the ranks' progress records while a job runs, reading their stack
dumps, and saying where each rank is when none makes progress (and which ranks are slower than the
rest when the job ends).
"""
