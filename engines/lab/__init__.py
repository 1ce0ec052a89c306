"""The lab's shared Python: the findings tables and counterexamples of every engine script
(:mod:`.findings`) and their command line (:mod:`.command_line`), the opt-in tests'
measurements (:mod:`.records`), and the HF-format fixture builder for environments without MLX
(``build_hf_models.py``). Nothing in ``pytest_prefixcache``, ``reference_engine`` or ``tests``
imports it."""
