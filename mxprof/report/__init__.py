"""After recording: the HTML report, optimisation hints (``mxprof.report.hints``) and diffs."""
