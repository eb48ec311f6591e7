"""`--metrics-config summary_quantiles=<q>:<error>,...` read as tritonserver reads it.

Triton's core (`MetricReporterConfig::ParseQuantiles`, docs/compatibility.md, issue 28 item 14)
splits on ',', splits each pair at its first ':' and reads both halves with `std::stod`, which
takes the longest leading number and ignores the rest (`0.0.1` is 0.0). A pair without ':' or
without a leading number is logged and skipped; when nothing is left the defaults stay. Triton's
own qa passes `0.1:0.0.1,...` and expects the server to start, so nothing here may refuse it.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger("shoal.gateway")

# what strtod takes from the start of a string after leading whitespace (decimal, inf, nan;
# its hexadecimal form is left out: no quantile is written so)
_LEADING_NUMBER = re.compile(r"\s*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))", re.IGNORECASE)


def stod(text: str) -> float | None:
    """The value `std::stod` reads from `text`, or None where it throws invalid_argument."""
    match = _LEADING_NUMBER.match(text)
    if match is None:
        return None
    return float(match.group(1))


def parse_quantiles(options: str) -> tuple[tuple[float, float], ...]:
    """The (quantile, error) pairs of `options`; pairs Triton skips are logged and skipped."""
    pairs: list[tuple[float, float]] = []
    for pair in options.split(","):
        quantile_text, colon, error_text = pair.partition(":")
        if not colon:
            if pair:  # std::getline yields no token after a trailing ','
                log.error("Invalid option: [%s]. No ':' delimiter found. Expected format is <quantile>:<error>", pair)
            continue
        quantile, error = stod(quantile_text), stod(error_text)
        if quantile is None or error is None:
            log.error("Invalid option: [%s]. Error: stod", pair)
            continue
        pairs.append((quantile, error))
    return tuple(pairs)
