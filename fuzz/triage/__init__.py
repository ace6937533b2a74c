"""Triage of a finding: which backends disagree with the oracle (``survey``), a smaller case that
still fails (the campaign's minimizer, ``pa_oracle.fuzz.campaign.minimize``, with every pass and
triage's budget), where the error sits and what pattern it follows (``localize``), and a markdown
+ HTML report with plots and a ready-to-paste regression test (``render``, ``plots``).
``golden`` promotes a finding into the regression corpus; ``cli`` holds the click commands.
"""
