"""Verification: how drafted tokens are accepted. Logits processing and token choice (``sampling``), token
trees and their attention mask (``tree_accept``), and the accept rule (``accept``), the one place where a
verified block of drafts (a chain is a one-child tree) becomes committed tokens. Pure functions of logits
and token ids: this part imports nothing else of the runtime, so the scheduler and external drafts share
one accept rule."""
