"""Helpers combining futures: ``collect`` and ``compose``."""

import threading

from . import _base

__all__ = ["collect", "compose"]


def collect(fs):
    """Gather a collection of futures in a new future.

    The new future's result is the list of the results of ``fs`` (in order);
    it fails with the first exception among them, and is cancelled if any of
    them is.  Cancelling it cancels the pending ones.
    """
    fs = list(fs)
    if not fs:
        future = _base.Future()
        future.set_result([])
        return future
    slots = {}
    for index, item in enumerate(fs):
        slots.setdefault(item, []).append(index)
    future = fs[0].__class__()
    results = [None] * len(fs)
    lock = threading.RLock()
    state = {"pending": slots}

    def item_done(item):
        with lock:
            pending = state["pending"]
            if pending is None:
                return
            if item.cancelled():
                future.cancel()
                return
            exc = item.exception()
            if exc is not None:
                if future.set_running_or_notify_cancel():
                    future.set_exception(exc)
                return
            for index in pending.pop(item):
                results[index] = item.result()
            if not pending and future.set_running_or_notify_cancel():
                future.set_result(results)

    def collected(fut):
        with lock:
            pending, state["pending"] = state["pending"], None
            for item in pending or ():
                item.cancel()
        if fut.cancelled():
            fut.set_running_or_notify_cancel()

    future.add_done_callback(collected)
    for item in list(slots):
        item.add_done_callback(item_done)
    return future


def compose(future, resulthook=None, excepthook=None):
    """Compose the completion of a future with result and exception handlers.

    The returned future completes when ``future`` does: with
    ``resulthook(result)`` (or the result itself) on success; on failure with
    ``excepthook(exception)``, set as its exception if that is an exception
    and as its result otherwise (or the exception itself without a hook).
    Cancelling either future cancels the other.
    """
    new = future.__class__()

    def new_done(fut):
        if fut.cancelled():
            fut.set_running_or_notify_cancel()
            future.cancel()

    def old_done(old):
        try:
            if old.cancelled():
                new.cancel()
            elif old.exception() is not None:
                reason = old.exception()
                if excepthook:
                    reason = excepthook(reason)
                if isinstance(reason, BaseException):
                    new.set_exception(reason)
                else:
                    new.set_result(reason)
            else:
                result = old.result()
                if resulthook:
                    result = resulthook(result)
                new.set_result(result)
        except BaseException as exc:
            new.set_exception(exc)

    new.add_done_callback(new_done)
    future.add_done_callback(old_done)
    return new
