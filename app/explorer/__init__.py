"""The what-if explorer's shared code (``app/`` pages import it; ``fmsim`` never does).

``logic`` computes (fmsim API in, frozen outcomes out, no streamlit); ``cache`` wraps it in
Streamlit caches keyed by immutable values; ``charts`` draws with altair; ``widgets`` holds the
page pieces the pages share.
"""
