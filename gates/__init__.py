"""End-to-end accuracy gates: a Hugging Face model runs its attention through a backend adapter
of this suite (``pa_oracle.gates.swap``), and its outputs are compared with a reference run (``pa_oracle.gates.logits``
teacher-forced log-probs; ``pa_oracle.gates.gsm8k`` task accuracy).

Needs ``transformers`` (``pip install 'paged-attention-oracle[test]'``); nothing here is imported by
``oracle/``, ``fuzz/`` or ``backends/``.
"""
