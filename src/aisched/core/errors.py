"""Errors of the core's configuration, in a module of their own so that what raises them
(the plugin registry) and what builds policies from them (`policy`) need not import each other
in a circle."""

from __future__ import annotations


class PolicyError(ValueError):
    """A policy mapping names an unknown plugin or gives a bad argument."""
