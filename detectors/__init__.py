"""failslow detectors: pure, clock-free analysis of collective timings.

Only numpy, scipy, scikit-learn and ruptures are used here. Inputs are arrays and frozen
dataclasses; time is always passed in. Every finding carries the reason behind it.
"""
