"""Mentored decoding core: pure, batched tensor functions over ``[..., V]``.

Paper letters inside the math: p = drafter, q = target. Public arguments are named
``draft_probs`` / ``target_probs``. Definitions: ``docs/theory.md``.
"""
