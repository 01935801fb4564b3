"""Verification: how drafted tokens are accepted. Logits processing, token choice and the speculative
acceptance rule of a chain step (``sampling``), and token trees with their attention mask and the greedy
and typical acceptance rules of a tree step (``tree_accept``). Pure functions of logits and token ids:
this part imports nothing else of the runtime, so the engines, the drafters and the scheduler share one
acceptance rule."""
