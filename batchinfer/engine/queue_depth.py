"""How many items a worker holds, and when it is refilled: read by the scheduler (which
dispatches by them), the board's core workers (which hold results back for a refill's
worth), the Ray pool (whose calls hold them) and planning (slots are made of them). Kept
apart from scheduler.py so that none of those reads the scheduler for a number.
"""

from __future__ import annotations

# Items a worker holds per instance: one in inference and the rest queued behind it, so an
# instance never waits for the coordinator between two inferences, even while the worker
# holds finished results back for a moment to send several in one message (board/worker.py).
QUEUED_PER_INSTANCE = 6
# Fewer, larger messages: a core is refilled (up to its capacity) once it holds at most
# REFILL_AT items per instance, so one message carries several items instead of each item
# travelling alone as soon as a slot is ready; what it still holds then keeps it busy while
# the refill travels.
REFILL_AT = QUEUED_PER_INSTANCE // 2
