"""Synthetic data for Primus Flow (CTR: users, items, impressions, clicks)."""
