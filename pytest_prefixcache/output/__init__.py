"""What a run leaves behind: the report and the saved request streams (the HTML page is
:mod:`pytest_prefixcache.html`)."""
