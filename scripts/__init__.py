"""Tooling run from the checkout (never imported by the product)."""
