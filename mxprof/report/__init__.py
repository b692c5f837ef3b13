"""After recording: the HTML report, the diff of two profiles (``mxprof.report.diff``)
and optimisation hints (``mxprof.report.hints``)."""
