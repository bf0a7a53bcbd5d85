"""Attention classes copied unchanged from public repositories (README.md), with their manifest (catalogue.py)."""
