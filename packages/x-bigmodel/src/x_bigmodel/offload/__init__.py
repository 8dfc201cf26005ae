"""Offloaded weights: where they live between forwards (RAM or a mapped file) and how they come back.

``weights`` holds one offloaded tensor and brings it onto its execution device; ``blocks`` a
module's offloaded weights brought in for a forward and released after; ``prefetch`` fetches the
next block on a background thread (``job_thread``) under a bound on mapped pages (``page_budget``).
"""
