"""The scripted HTTP receiver of test_notify, shared with the other ticket-sink tests."""

from tests.notify.test_notify import receiver

__all__ = ["receiver"]
