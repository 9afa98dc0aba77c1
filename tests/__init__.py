"""The test suite: unit/, property/, integration/, e2e/, fuzz/; shared helpers in support/."""
