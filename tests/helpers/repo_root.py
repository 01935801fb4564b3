"""The checkout's root folder, for tests that read its docs, docker files and sources."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
