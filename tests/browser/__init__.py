"""Browser tests (Playwright driving Debian's chromium); see conftest.py."""
