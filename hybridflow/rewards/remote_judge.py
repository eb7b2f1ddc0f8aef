"""A remote judge: each sample scored by the user's HTTP server (``reward_model.reward_manager=remote``).

Each sample is one ``POST`` of a JSON object to ``url``: ``data_source``, ``prompt`` (the prompt as the model saw
it: chat template applied, padding removed), ``response`` (decoded as the other managers decode it),
``ground_truth`` and ``extra_info``. The server answers a JSON number, or an object with a numeric ``"score"``
whose other fields become per-sample reward extra info, as a reward function's dict does.

Options, as ``+reward_model.reward_kwargs.<name>`` (verl hands ``reward_kwargs`` to its manager the same way):
``url`` (required; the name of verl's ``sandbox_fusion.url``), ``max_concurrent`` (requests in flight at most,
default 64 as verl's ``sandbox_fusion.max_concurrent``; a step's samples are sent together up to it),
``timeout_s`` (each wait on the server, to connect and for the answer; default 30), ``max_retries`` (after a
connection error or a 5xx answer; default 2) and ``retry_backoff_s`` (the wait before the first retry, doubled
before each next one; default 0.5), plus the naive manager's ``max_failed_share`` and ``num_examine``.

Failures follow the reward managers' convention (:mod:`hybridflow.rewards.failures`): the sample scores 0 and
counts in ``reward/score_timeouts`` (no answer within ``timeout_s``; not retried, since a second wait on a
server that is too slow doubles the step's time) or ``reward/score_errors`` (no connection or a 5xx after every
attempt, a 4xx, a body that is no score); once at least ``max_failed_share`` of a batch failed (default 1.0:
all of it, as when the server is down) :class:`RewardFunctionError` stops the run in one line naming the URL
and the first failure. A call stuck past every limit (a server that trickles its answer) is abandoned as a
timeout after all its attempts' time; its thread finishes on its own while a fresh one takes its place (so until
it does, one request more than ``max_concurrent`` may be in flight).

Differs from verl: verl's ``sandbox_fusion`` block calls Sandbox Fusion's code-execution API with a
data_source's test cases; this manager sends the sample itself to any server that answers a score.
"""

from __future__ import annotations

import functools
import http.client
import json
import math
import numbers
import time
import urllib.error
import urllib.request
from typing import Any, Mapping
from urllib.parse import urlsplit

from hybridflow.rewards.failures import Failure
from hybridflow.rewards.managers import REWARD_MANAGERS, NaiveRewardManager, RewardCallError
from hybridflow.rewards.response_batch import ResponseBatch, read_response_batch
from hybridflow.rewards.timed_calls import CallOutcome, CallTimeout

OPTIONS = "reward_model.reward_kwargs"
BODY_SHOWN = 200  # characters of a bad answer's body shown in its error line
# option: (integer?, smallest allowed value, whether that value itself is allowed)
_LIMITS = {
    "max_concurrent": (True, 1, True),
    "timeout_s": (False, 0, False),
    "max_retries": (True, 0, True),
    "retry_backoff_s": (False, 0, True),
}


class RemoteJudgeError(RuntimeError):
    """The judge server gave no score for a sample (one line naming its URL)."""


class _Transient(Exception):
    """A failure worth another attempt: no connection, or a 5xx answer."""


def remote_judge_option_errors(options: Mapping[str, Any]) -> list[str]:
    """One line per option of the remote judge that cannot work, naming its key and what it must be."""
    url = options.get("url")
    parts = urlsplit(url) if isinstance(url, str) else None
    errors = []
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        errors.append(
            f"{OPTIONS}.url={url!r} must be the judge server's http:// or https:// URL, "
            "e.g. +reward_model.reward_kwargs.url=http://127.0.0.1:8000/score"
        )
    for name, (integer, smallest, inclusive) in _LIMITS.items():
        if name not in options:
            continue  # the manager's default
        value = options[name]
        kind = numbers.Integral if integer else numbers.Real
        fits = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)
        if not (fits and (value >= smallest if inclusive else value > smallest)):
            bound = f"{'>=' if inclusive else '>'} {smallest}"
            errors.append(f"{OPTIONS}.{name}={value!r} must be {'an integer' if integer else 'a number'} {bound}")
    return errors


def body_start(raw: bytes) -> str:
    """The first characters of a server's answer, quoted, for an error line."""
    text = raw.decode("utf-8", "replace")
    return repr(text[:BODY_SHOWN]) + ("..." if len(text) > BODY_SHOWN else "")


def _as_json(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars, as parquet rows hold lists and numbers
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class RemoteJudge:
    """``judge(data_source, solution_str, ground_truth, extra_info, prompt)``: one sample's score from the server,
    a float or a dict with ``"score"``; raises :class:`RemoteJudgeError` or, past ``timeout_s``, ``CallTimeout``."""

    def __init__(self, url: str, timeout_s: float = 30.0, max_retries: int = 2, retry_backoff_s: float = 0.5):
        self.url, self.timeout_s = url, timeout_s
        self.max_retries, self.retry_backoff_s = max_retries, retry_backoff_s

    def __call__(
        self, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None, prompt: str | None = None
    ) -> float | dict[str, Any]:
        sample = {
            "data_source": data_source,
            "prompt": prompt,
            "response": solution_str,
            "ground_truth": ground_truth,
            "extra_info": extra_info,
        }
        try:
            body = json.dumps(sample, default=_as_json).encode()
        except (TypeError, ValueError) as error:
            raise RemoteJudgeError(f"the sample for {self.url} does not convert to JSON: {error}") from None
        return self.score(self.post(body))

    def longest_call_s(self) -> float:
        """The most a call can take within its limits: each attempt waits twice (connect, answer), plus backoffs."""
        attempts = self.max_retries + 1
        return attempts * 2 * self.timeout_s + self.retry_backoff_s * (2**self.max_retries - 1) + 1.0

    def post(self, body: bytes) -> bytes:
        """The server's answer to ``body``, retried after a connection error or a 5xx with growing waits."""
        for attempt in range(self.max_retries + 1):
            try:
                return self._send(body)
            except _Transient as error:
                if attempt == self.max_retries:
                    raise RemoteJudgeError(
                        f"POST {self.url} failed on all {attempt + 1} attempts ({OPTIONS}.max_retries="
                        f"{self.max_retries}), the last: {error}; is the judge server up and answering at "
                        f"{OPTIONS}.url?"
                    ) from None
                time.sleep(self.retry_backoff_s * 2**attempt)

    def _send(self, body: bytes) -> bytes:
        request = urllib.request.Request(
            self.url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as error:
            answer = f"HTTP {error.code}, body {body_start(_read_quietly(error))}"
            if error.code >= 500:
                raise _Transient(answer) from None
            raise RemoteJudgeError(
                f"POST {self.url} answered {answer} (not retried); fix the request or the server"
            ) from None
        except (TimeoutError, urllib.error.URLError, ConnectionError, http.client.HTTPException) as error:
            reason = error.reason if isinstance(error, urllib.error.URLError) else error
            if isinstance(reason, TimeoutError):
                raise CallTimeout(
                    f"POST {self.url} got no answer within {self.timeout_s:g} s ({OPTIONS}.timeout_s); "
                    "make the server faster or raise the limit"
                ) from None
            raise _Transient(f"{type(reason).__name__}: {reason}") from None

    def score(self, raw: bytes) -> float | dict[str, Any]:
        """The answer's score: a JSON number, or an object with a numeric ``"score"``."""
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        score = value.get("score") if isinstance(value, dict) else value
        if not isinstance(score, numbers.Real) or isinstance(score, bool):
            raise RemoteJudgeError(
                f"POST {self.url} answered a body that is not a JSON number or an object with a numeric 'score': "
                f'{body_start(raw)}; make the server answer e.g. {{"score": 1.0}}'
            )
        return value


def _read_quietly(error: urllib.error.HTTPError) -> bytes:
    try:
        return error.read()
    except (OSError, http.client.HTTPException):
        return b""


SCORES_WITHOUT_FUNCTION = (
    "reward_model.reward_manager=remote scores with the server at reward_model.reward_kwargs.url, not with "
    "custom_reward_function.path; unset one of them"
)


class RemoteJudgeManager(NaiveRewardManager):
    """The naive manager's per-sample scoring, each sample a request to the judge server at ``url`` (see the module
    docstring); ``max_concurrent`` threads send a batch's requests, so at most that many are in flight."""

    def __init__(
        self,
        tokenizer: Any,
        compute_score: None = None,
        num_examine: int = 0,
        *,
        url: str,
        max_concurrent: int = 64,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        retry_backoff_s: float = 0.5,
        reward_fn_key: str = "data_source",
        max_failed_share: float = 1.0,
    ):
        if compute_score is not None:
            raise RewardCallError(SCORES_WITHOUT_FUNCTION)
        options = {"url": url, "max_concurrent": max_concurrent, "timeout_s": timeout_s, "max_retries": max_retries}
        errors = remote_judge_option_errors({**options, "retry_backoff_s": retry_backoff_s})
        if errors:
            raise RewardCallError("; ".join(errors))
        self.judge = RemoteJudge(url, timeout_s, max_retries, retry_backoff_s)
        super().__init__(
            tokenizer,
            self.judge,
            num_examine,
            timeout_s=self.judge.longest_call_s(),  # the threads' limit: a backstop behind the requests' own
            max_workers=max_concurrent,
            reward_fn_key=reward_fn_key,
            max_failed_share=max_failed_share,
        )

    def read(self, data: Any) -> ResponseBatch:
        """The naive manager's columns and each prompt, which a judge reads with the response."""
        return read_response_batch(data, self.tokenizer, self.reward_fn_key, with_prompts=True)

    def outcomes(self, responses: ResponseBatch) -> list[CallOutcome]:
        """One request's outcome per sample, ``max_concurrent`` of them at a time."""
        calls = [
            functools.partial(self.judge, *sample)
            for sample in zip(
                responses.data_sources,
                responses.solution_strs,
                responses.ground_truths,
                responses.extra_infos,
                responses.prompt_strs,
            )
        ]
        return self.runner.run(calls)

    def failure_line(self, first: Failure, failed: int, total: int) -> str:
        return (
            f"the remote judge at {self.judge.url} failed on {failed} of {total} samples, at least "
            f"{OPTIONS}.max_failed_share={self.max_failed_share:g} of them; first: {first}"
        )


REWARD_MANAGERS.add("remote", RemoteJudgeManager, scores_with_function=False, option_errors=remote_judge_option_errors)
