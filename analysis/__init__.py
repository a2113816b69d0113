"""Figures from stores: one function per paper figure."""
