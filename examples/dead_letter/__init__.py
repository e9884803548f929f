"""The dead-letter example: poison orders go to a dead-letter topic, flaky calls are retried,
and nothing healthy waits for either. See README.md; run it with ``python -m examples.dead_letter``.
"""
