"""After recording: the HTML report, the diff of two profiles, hints (issue 12)."""
