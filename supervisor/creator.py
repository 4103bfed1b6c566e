"""Moved to `supervisor.creators` (issue 23); this module keeps the old import path working."""
from __future__ import annotations

from supervisor.creators.base import Restored, SessionCreator, check_session_fns, default_ready_fn

__all__ = ["SessionCreator", "Restored", "default_ready_fn", "check_session_fns"]
