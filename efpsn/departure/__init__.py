"""Membership changes as pure functions: a party that leaves for good, the masks and stop rule
after it, its replay."""
