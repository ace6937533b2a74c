"""End-to-end accuracy gates: a Hugging Face model runs its attention through a backend adapter
of this suite (``gates.swap``), and its outputs are compared with a reference run (``gates.logits``
teacher-forced log-probs; ``gates.gsm8k`` task accuracy).

Needs ``transformers`` (``pip install 'paged-attention-oracle[test]'``); nothing here is imported by
``oracle/``, ``fuzz/`` or ``backends/``.
"""
