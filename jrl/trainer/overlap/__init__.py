"""The rollout on devices of its own, overlapping training (``hybrid_engine=False``)."""
