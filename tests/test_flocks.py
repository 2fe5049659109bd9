"""try_flock: taken, held by another open file, and an error that is not "held"; take_flock
waits out a probe but not a holder."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from batchinfer.flocks import take_flock, try_flock


def test_a_lock_is_taken_when_free_and_refused_while_another_open_file_holds_it(tmp_path):
    path = tmp_path / "lock"
    path.touch()
    first, second = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    try:
        assert try_flock(first, fcntl.LOCK_EX)
        assert not try_flock(second, fcntl.LOCK_SH)
        fcntl.flock(first, fcntl.LOCK_UN)
        assert try_flock(second, fcntl.LOCK_SH)
    finally:
        os.close(first)
        os.close(second)


def test_an_error_other_than_held_is_raised(tmp_path):
    fd = os.open(tmp_path / "lock", os.O_RDWR | os.O_CREAT)
    os.close(fd)
    with pytest.raises(OSError) as caught:
        try_flock(fd, fcntl.LOCK_EX)  # closed: EBADF, not "someone holds it"
    assert caught.value.errno == errno.EBADF


def test_a_lock_held_for_good_is_refused_once_the_patience_is_spent(tmp_path):
    path = tmp_path / "lock"
    path.touch()
    holder, taker = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    try:
        fcntl.flock(holder, fcntl.LOCK_SH)
        assert not take_flock(taker, fcntl.LOCK_EX, patience_s=0.01)
        fcntl.flock(holder, fcntl.LOCK_UN)
        assert take_flock(taker, fcntl.LOCK_EX, patience_s=0.01)
    finally:
        os.close(holder)
        os.close(taker)
