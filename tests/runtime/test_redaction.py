"""Redaction: real-shaped secrets are masked, look-alikes are left alone, values keep their shape.

Every secret here is invented. Those with a provider's prefix are assembled at run time from a
prefix and generated characters, so no literal token that looks real sits in the source.
"""

from __future__ import annotations

import base64
import json
import random
import re
import string
from typing import Any

import pytest

from onward.errors import ConfigurationError
from onward.eventlog.events import Message, ModelAnswered, ToolCall, ToolCompleted
from onward.runtime.redaction import DEFAULT_MASK, Redactor

ALNUM = string.ascii_letters + string.digits
UPPER_ALNUM = string.ascii_uppercase + string.digits
URLSAFE = ALNUM + "-_"
HEX = "0123456789abcdef"


def fake(length: int, alphabet: str = ALNUM, *, seed: int) -> str:
    """Invented characters of a secret's alphabet; the same for the same seed."""
    rng = random.Random(seed)
    return "".join(rng.choice(alphabet) for _ in range(length))


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def pem_block(kind: str, *, seed: int) -> tuple[str, list[str]]:
    """A private key block of ``kind`` (``RSA``, ``OPENSSH``) and its body lines."""
    body = base64.b64encode(random.Random(seed).randbytes(180)).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    label = f"{kind} PRIVATE KEY" if kind else "PRIVATE KEY"
    block = "\n".join([f"-----BEGIN {label}-----", *lines, f"-----END {label}-----"])
    return block, lines


OPENAI_LEGACY = "sk-" + fake(20, seed=1) + "T3BlbkFJ" + fake(20, seed=2)
OPENAI_PROJECT = "sk-" + "proj-" + fake(74, URLSAFE, seed=3) + "T3BlbkFJ" + fake(74, seed=4)
ANTHROPIC = "sk-" + "ant-api03-" + fake(93, URLSAFE, seed=5) + "AA"
AWS_KEY_ID = "AK" + "IA" + fake(16, UPPER_ALNUM, seed=6)
AWS_STS_KEY_ID = "AS" + "IA" + fake(16, UPPER_ALNUM, seed=7)
AWS_SECRET = fake(40, ALNUM + "/+", seed=8)
GITHUB_CLASSIC = "gh" + "p_" + fake(36, seed=9)
GITHUB_OAUTH = "gh" + "o_" + fake(36, seed=10)
GITHUB_APP = "gh" + "s_" + fake(36, seed=11)
GITHUB_FINE = "github" + "_pat_" + fake(22, seed=12) + "_" + fake(59, seed=13)
GITLAB = "gl" + "pat-" + fake(20, URLSAFE, seed=14)
SLACK_BOT = "xo" + "xb-" + fake(12, string.digits, seed=15) + "-" + fake(13, string.digits, seed=16)
SLACK_BOT += "-" + fake(24, seed=17)
SLACK_USER = "xo" + "xp-" + fake(12, string.digits, seed=18) + "-" + fake(32, HEX, seed=19)
SLACK_APP = (
    "xa" + "pp-1-A" + fake(10, UPPER_ALNUM, seed=20) + "-" + fake(13, string.digits, seed=21)
)
SLACK_APP += "-" + fake(64, HEX, seed=22)
SLACK_HOOK_PATH = (
    "T" + fake(8, UPPER_ALNUM, seed=23) + "/B" + fake(10, UPPER_ALNUM, seed=24) + "/"
) + fake(24, seed=25)
STRIPE_LIVE = "sk" + "_live_" + fake(99, seed=26)
STRIPE_RESTRICTED = "rk" + "_live_" + fake(99, seed=27)
STRIPE_TEST = "sk" + "_test_" + fake(24, seed=28)
GOOGLE_API = "AI" + "za" + fake(35, URLSAFE, seed=29)
GOOGLE_OAUTH = "ya" + "29." + fake(150, URLSAFE, seed=30)
SENDGRID = "SG" + "." + fake(22, URLSAFE, seed=31) + "." + fake(43, URLSAFE, seed=32)
TWILIO = "SK" + fake(32, HEX, seed=33)
NPM = "np" + "m_" + fake(36, seed=34)
HUGGINGFACE = "hf" + "_" + fake(34, string.ascii_letters, seed=35)
JWT = ".".join(
    [
        b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()),
        b64url(json.dumps({"sub": "user-7", "iat": 1715940000, "scope": "runs:write"}).encode()),
        fake(43, URLSAFE, seed=36),
    ]
)
BEARER = fake(40, URLSAFE, seed=37) + "1"
BASIC = base64.b64encode(b"deploy:" + fake(18, seed=38).encode()).decode()
RSA_BLOCK, RSA_LINES = pem_block("RSA", seed=39)
OPENSSH_BLOCK, OPENSSH_LINES = pem_block("OPENSSH", seed=40)
PASSWORD = fake(16, ALNUM + "!#%^*", seed=41)
AZURE_KEY = base64.b64encode(random.Random(42).randbytes(64)).decode()
CLIENT_SECRET = fake(40, URLSAFE, seed=43)
GROQ = "gs" + "k_" + fake(52, seed=44)
XAI = "xa" + "i-" + fake(80, seed=45)
AZURE_FUNCTION_KEY = fake(54, URLSAFE, seed=46) + "%3D%3D"
OAUTH_CODE = "4%2F0A" + fake(70, URLSAFE, seed=47)
FIREBASE_SECRET = fake(40, seed=48)


SECRETS = [
    pytest.param(
        f"my key is {OPENAI_LEGACY}, why does the API answer 401?",
        [OPENAI_LEGACY],
        id="openai-legacy-in-prose",
    ),
    pytest.param(
        f"2024-05-17 12:00:01 INFO openai: using {OPENAI_PROJECT} for project onward",
        [OPENAI_PROJECT],
        id="openai-project-in-log",
    ),
    pytest.param(
        f"anthropic 401 for key {ANTHROPIC}: invalid x-api-key",
        [ANTHROPIC],
        id="anthropic-in-log",
    ),
    pytest.param(
        f"AWS Access Key ID [None]: {AWS_KEY_ID}",
        [AWS_KEY_ID],
        id="aws-access-key-id-in-cli-prompt",
    ),
    pytest.param(
        json.dumps({"AccessKeyId": AWS_STS_KEY_ID, "Expiration": "2024-05-17T13:00:00Z"}),
        [AWS_STS_KEY_ID],
        id="aws-sts-key-id-in-json",
    ),
    pytest.param(
        f"[default]\naws_secret_access_key = {AWS_SECRET}\nregion = eu-west-1\n",
        [AWS_SECRET],
        id="aws-secret-in-credentials-file",
    ),
    pytest.param(
        f"git clone https://{GITHUB_CLASSIC}@github.com/onward/onward.git",
        [GITHUB_CLASSIC],
        id="github-classic-in-clone-url",
    ),
    pytest.param(
        json.dumps({"token_type": "bearer", "token": GITHUB_OAUTH}),
        [GITHUB_OAUTH],
        id="github-oauth-in-json",
    ),
    pytest.param(
        f"remote: https://x-access-token:{GITHUB_APP}@github.com/onward/onward.git",
        [GITHUB_APP],
        id="github-app-as-url-password",
    ),
    pytest.param(
        f"use {GITHUB_FINE} for the release workflow",
        [GITHUB_FINE],
        id="github-fine-grained-in-prose",
    ),
    pytest.param(
        f'curl --header "PRIVATE-TOKEN: {GITLAB}" https://gitlab.example.com/api/v4/projects',
        [GITLAB],
        id="gitlab-in-curl",
    ),
    pytest.param(
        f"client = WebClient(token='{SLACK_BOT}')",
        [SLACK_BOT],
        id="slack-bot-in-code",
    ),
    pytest.param(
        f"slack: posting as user with {SLACK_USER} to #ops",
        [SLACK_USER],
        id="slack-user-in-log",
    ),
    pytest.param(
        f"socket mode app token {SLACK_APP}",
        [SLACK_APP],
        id="slack-app-token",
    ),
    pytest.param(
        f"POST https://hooks.slack.com/services/{SLACK_HOOK_PATH} -> 200 ok",
        [SLACK_HOOK_PATH],
        id="slack-webhook-url",
    ),
    pytest.param(
        f"stripe.error.AuthenticationError: Invalid API Key provided: {STRIPE_LIVE}",
        [STRIPE_LIVE],
        id="stripe-live-in-traceback",
    ),
    pytest.param(
        f"payments worker configured with {STRIPE_RESTRICTED}",
        [STRIPE_RESTRICTED],
        id="stripe-restricted",
    ),
    pytest.param(
        f"curl https://api.stripe.com/v1/charges -u {STRIPE_TEST}:",
        [STRIPE_TEST],
        id="stripe-test-in-curl",
    ),
    pytest.param(
        f"https://maps.googleapis.com/maps/api/geocode/json?address=Paris&key={GOOGLE_API}",
        [GOOGLE_API],
        id="google-api-key-in-url",
    ),
    pytest.param(
        f"$ gcloud auth print-access-token\n{GOOGLE_OAUTH}\n",
        [GOOGLE_OAUTH],
        id="google-oauth-in-shell-output",
    ),
    pytest.param(
        f"sendgrid client created with {SENDGRID}",
        [SENDGRID],
        id="sendgrid",
    ),
    pytest.param(
        f"twilio api key sid {TWILIO} created",
        [TWILIO],
        id="twilio-api-key",
    ),
    pytest.param(
        f"//registry.npmjs.org/:_authToken={NPM}",
        [NPM],
        id="npm-in-npmrc",
    ),
    pytest.param(
        f"$ huggingface-cli login --token {HUGGINGFACE}",
        [HUGGINGFACE],
        id="huggingface-in-command",
    ),
    pytest.param(
        f"id token received from the identity provider {JWT} (expires in 3600 s)",
        [JWT],
        id="jwt-in-prose",
    ),
    pytest.param(
        f'curl -H "Authorization: Bearer {BEARER}" https://api.example.com/v1/me',
        [BEARER],
        id="bearer-header-in-curl",
    ),
    pytest.param(
        f"401 from upstream, retrying with bearer {BEARER}",
        [BEARER],
        id="bearer-without-header",
    ),
    pytest.param(
        f"GET /admin HTTP/1.1\r\nHost: example.com\r\nAuthorization: Basic {BASIC}\r\n",
        [BASIC],
        id="basic-auth-header",
    ),
    pytest.param(
        f"here is the deploy key:\n{RSA_BLOCK}\nkeep it safe",
        RSA_LINES,
        id="pem-rsa-block",
    ),
    pytest.param(
        json.dumps({"path": "~/.ssh/id_ed25519", "content": OPENSSH_BLOCK}),
        OPENSSH_LINES,
        id="pem-openssh-in-json-string",
    ),
    pytest.param(
        f"DATABASE_URL=postgresql://onward:{PASSWORD}@db.internal:5432/onward",
        [PASSWORD],
        id="postgres-url-password",
    ),
    pytest.param(
        f"redis://:{PASSWORD}@cache.internal:6379/0",
        [PASSWORD],
        id="redis-url-password-without-user",
    ),
    pytest.param(
        f"GET /login?user=jane&password={PASSWORD}&next=/home HTTP/1.1",
        [PASSWORD],
        id="password-in-query-string",
    ),
    pytest.param(
        json.dumps({"username": "jane", "password": "correct horse battery staple"}),
        ["correct horse battery staple", "battery"],
        id="json-password-with-spaces",
    ),
    pytest.param(
        "database:\n  user: app\n  passwd: Tr0ub4dor&3\n",
        ["Tr0ub4dor&3", "Tr0ub4dor"],
        id="yaml-passwd",
    ),
    pytest.param(
        f"grant_type=client_credentials&client_id=onward-web&client_secret={CLIENT_SECRET}&x=1",
        [CLIENT_SECRET],
        id="client-secret-in-form-body",
    ),
    pytest.param(
        f"apikey: {CLIENT_SECRET}",
        [CLIENT_SECRET],
        id="apikey-header",
    ),
    pytest.param(
        f"https://graph.example.com/me?fields=id,name&access_token={CLIENT_SECRET}",
        [CLIENT_SECRET],
        id="access-token-in-url",
    ),
    pytest.param(
        "DefaultEndpointsProtocol=https;AccountName=onwardruns;"
        f"AccountKey={AZURE_KEY};EndpointSuffix=core.windows.net",
        [AZURE_KEY],
        id="azure-storage-connection-string",
    ),
    pytest.param(
        f"curl -u admin:{PASSWORD} https://jenkins.example.com/api/json",
        [PASSWORD],
        id="curl-user-password",
    ),
    pytest.param(
        f"export CI_DEPLOY_TOKEN={CLIENT_SECRET}",
        [CLIENT_SECRET],
        id="env-token-variable",
    ),
    pytest.param(
        f"$db = new PDO($dsn, 'app', null, ['password' => '{PASSWORD}']);",
        [PASSWORD],
        id="php-arrow-password",
    ),
    pytest.param(
        json.dumps({"stdout": json.dumps({"api_key": CLIENT_SECRET, "region": "eu"})}),
        [CLIENT_SECRET],
        id="api-key-in-json-inside-a-json-string",
    ),
    pytest.param(
        f"groq.AuthenticationError: Invalid API Key {GROQ}",
        [GROQ],
        id="groq-key-in-traceback",
    ),
    pytest.param(
        f"xai 400: Incorrect API key provided: {XAI}. Obtain an API key from console.x.ai",
        [XAI],
        id="xai-key-in-error",
    ),
    pytest.param(
        f"POST https://onward-fn.azurewebsites.net/api/resume?code={AZURE_FUNCTION_KEY} -> 202",
        [AZURE_FUNCTION_KEY],
        id="azure-function-key-in-url",
    ),
    pytest.param(
        f"GET /oauth/callback?code={OAUTH_CODE}&state=af0ifjsldkj HTTP/1.1",
        [OAUTH_CODE],
        id="oauth-authorization-code-in-redirect",
    ),
    pytest.param(
        f"https://onward-runs.firebaseio.com/runs.json?auth={FIREBASE_SECRET}&print=pretty",
        [FIREBASE_SECRET],
        id="firebase-auth-in-url",
    ),
]


@pytest.mark.parametrize(("text", "secrets"), SECRETS)
def test_secret_is_masked(text: str, secrets: list[str]) -> None:
    masked = Redactor().redact_text(text)

    assert DEFAULT_MASK in masked
    for secret in secrets:
        assert secret not in masked


LOOK_ALIKES = [
    pytest.param(
        "I trained the baseline with sk-learn and it beat the transformer.", id="sk-learn"
    ),
    pytest.param("skip the cache and rebuild: make clean && make", id="skip"),
    pytest.param("fixed in commit 9fceb02d0ae598e95dc970b74767f19372d61af8", id="git-sha"),
    pytest.param("request 123e4567-e89b-12d3-a456-426614174000 timed out", id="uuid"),
    pytest.param(
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
        "YPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
        id="base64-image",
    ),
    pytest.param("AKIA is the prefix AWS uses for long-term access key ids.", id="akia-in-prose"),
    pytest.param("He was the Bearer of bad news.", id="bearer-of-bad-news"),
    pytest.param("password reset link sent to jane@example.com", id="password-reset"),
    pytest.param("ssh://git@github.com/onward/onward.git", id="url-user-without-password"),
    pytest.param("https://example.com/path?x=1&y=two", id="url-query"),
    pytest.param("contact jane.doe+onward@example.co.uk", id="email"),
    pytest.param("ey, are you there?", id="ey"),
    pytest.param("onward 0.1.0, python 3.11.7, msgspec 0.18.6", id="versions"),
    pytest.param("set the border to #1f2937 and the text to #f9fafb", id="hex-colours"),
    pytest.param("2024-05-17T12:34:56.789+02:00", id="iso-timestamp"),
    pytest.param("call me on +1 (415) 555-0132", id="phone-number"),
    pytest.param("the api_key parameter is required", id="api-key-bare-word"),
    pytest.param("the secret to good bread is time", id="secret-in-prose"),
    pytest.param("- **sk**: the *sk* in skate, sky and task", id="markdown-sk"),
    pytest.param("max_tokens=4096, temperature=0.2", id="max-tokens"),
    pytest.param("http://localhost:8080/health?verbose=true", id="localhost-with-port"),
    pytest.param("ghp_ is the prefix of classic GitHub personal access tokens", id="ghp-in-prose"),
    pytest.param("from sklearn.model_selection import train_test_split", id="sklearn"),
    pytest.param("passwordless login via a magic link", id="passwordless"),
    pytest.param('{"password_hint": "first pet", "secret": null}', id="json-hint-and-null"),
    pytest.param("def connect(host: str, password: str | None = None) -> None:", id="type-hints"),
    pytest.param("hf_hub_download(repo_id='gpt2', filename='config.json')", id="hf-hub"),
    pytest.param("xoxo, see you at the standup", id="xoxo"),
    pytest.param("the header alone, eyJhbGciOiJIUzI1NiJ9, is not a token", id="jwt-header-only"),
    pytest.param("docker run --user 1000:1000 onward:latest", id="docker-uid-gid"),
    pytest.param("401: Authorization header missing", id="authorization-in-prose"),
    pytest.param("arn:aws:s3:::onward-artifacts/runs/2024", id="aws-arn"),
    pytest.param("password: ${DB_PASSWORD}", id="password-placeholder"),
    pytest.param("risk-assessment-framework-v2-final-draft-2024", id="risk-kebab-case"),
    pytest.param("pip install xai-sdk groq && python -m xai-sdk --help", id="xai-sdk"),
    pytest.param("gsk_ is the prefix of Groq API keys", id="gsk-in-prose"),
    pytest.param("GET /v1/airports?code=CDG&lang=en", id="short-code-in-url"),
    pytest.param("GET /checkout?code=SUMMER2024&cart=9", id="promo-code-in-url"),
    pytest.param("the error code=E404 came back, auth=basic was refused", id="code-and-auth-words"),
    pytest.param("https://example.com/login?auth=required&next=/runs", id="auth-required-in-url"),
]


@pytest.mark.parametrize("text", LOOK_ALIKES)
def test_look_alike_is_unchanged(text: str) -> None:
    assert Redactor().redact_text(text) == text


def test_nested_values_are_masked_and_secret_keys_masked_whole() -> None:
    value = {
        "headers": {"Accept": f"text/plain; Bearer {BEARER}"},
        "items": [{"note": "ok"}, ("plain", f"token {GITHUB_CLASSIC}")],
        "Authorization": f"Bearer {BEARER}",
        GITHUB_OAUTH: 3,
    }

    masked = Redactor().redact(value)

    assert masked == {
        "headers": {"Accept": f"text/plain; Bearer {DEFAULT_MASK}"},
        "items": [{"note": "ok"}, ("plain", f"token {DEFAULT_MASK}")],
        "Authorization": DEFAULT_MASK,
        DEFAULT_MASK: 3,
    }
    assert value["Authorization"] == f"Bearer {BEARER}"


def test_bytes_are_left_as_the_same_object() -> None:
    data = ("password=" + PASSWORD).encode()
    parts = [bytearray(data), memoryview(data)]

    redactor = Redactor()

    assert redactor.redact(data) is data
    assert redactor.redact(parts) is parts


def test_clean_value_is_returned_as_the_same_object() -> None:
    value = {"city": "Paris", "days": [1, 2, 3], "units": ("metric", None), "raw": b"\x00"}

    assert Redactor().redact(value) is value


def envelope(seq: int) -> dict[str, Any]:
    """The envelope of the events of run-7, at ``seq``."""
    return {"run_id": "run-7", "tenant": "acme", "seq": seq, "fence": 3}


def test_redact_event_masks_tool_call_args_and_keeps_the_envelope() -> None:
    event = ModelAnswered(
        **envelope(12),
        at=1715940000000000,
        message=Message(role="assistant", content="Calling the API."),
        tool_calls=[
            ToolCall(
                call_id="call-1",
                tool="http",
                args={"url": "https://api.example.com", "headers": {"x-api-key": ANTHROPIC}},
            )
        ],
    )

    masked = Redactor().redact_event(event)

    assert masked.tool_calls[0].args["headers"]["x-api-key"] == DEFAULT_MASK
    assert masked.message is event.message
    assert (masked.run_id, masked.tenant, masked.seq, masked.fence, masked.at) == (
        "run-7",
        "acme",
        12,
        3,
        1715940000000000,
    )


def test_redact_event_masks_a_tool_result() -> None:
    event = ToolCompleted(
        **envelope(13),
        call_id="call-1",
        result={"stdout": f"export OPENAI_KEY={OPENAI_LEGACY}\n", "exit": 0},
    )

    masked = Redactor().redact_event(event)

    assert OPENAI_LEGACY not in masked.result["stdout"]
    assert masked.result["exit"] == 0
    assert (masked.call_id, masked.seq) == ("call-1", 13)


def test_clean_event_is_returned_as_the_same_object() -> None:
    event = ToolCompleted(
        run_id="run-7", tenant="acme", seq=13, fence=3, call_id="call-1", result={"temp": 21}
    )

    assert Redactor().redact_event(event) is event


def test_envelope_of_an_event_nested_in_a_value_is_kept() -> None:
    event = ToolCompleted(
        run_id="run-pwd=abcdef", tenant="acme", seq=1, fence=1, call_id="c", result="pwd=abcdef"
    )

    masked = Redactor().redact([event])[0]

    assert masked.run_id == "run-pwd=abcdef"
    assert masked.result == f"pwd={DEFAULT_MASK}"


def test_message_parts_mask_text_and_keep_binary() -> None:
    image = b"\x89PNG\r\n\x1a\n" + ("password=" + PASSWORD).encode()
    message = Message(role="user", content=[f"my key: {STRIPE_LIVE}", image])

    masked = Redactor().redact(message)

    assert masked.content[0] == f"my key: {DEFAULT_MASK}"
    assert masked.content[1] is image


def test_disabled_redactor_leaves_the_secret() -> None:
    event = ToolCompleted(
        run_id="run-7", tenant="acme", seq=13, fence=3, call_id="c", result=GITHUB_CLASSIC
    )
    redactor = Redactor(enabled=False)

    assert redactor.redact_event(event) is event
    assert redactor.redact_text(GITHUB_CLASSIC) == GITHUB_CLASSIC


def test_extra_patterns_mask_on_top_of_the_built_in_ones() -> None:
    redactor = Redactor(extra_patterns=(r"EMP-\d+",))

    masked = redactor.redact_text(f"EMP-4411 used {GITHUB_CLASSIC}; EMP-9 too")

    assert masked == f"{DEFAULT_MASK} used {DEFAULT_MASK}; {DEFAULT_MASK} too"


def test_extra_pattern_with_a_secret_group_masks_only_that_group() -> None:
    redactor = Redactor(extra_patterns=(re.compile(r"badge=(?P<secret>\d{6})"),))

    assert redactor.redact_text("door 3, badge=481516") == f"door 3, badge={DEFAULT_MASK}"


def test_invalid_extra_pattern_raises_configuration_error_naming_it() -> None:
    with pytest.raises(ConfigurationError, match=re.escape(r"`EMP-(\d+`")):
        Redactor(extra_patterns=(r"EMP-(\d+",))


def test_extra_pattern_matching_the_empty_string_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="empty string"):
        Redactor(extra_patterns=(r"x*",))


def test_a_single_string_as_extra_patterns_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="sequence of patterns"):
        Redactor(extra_patterns=r"EMP-\d+")


def test_overlapping_matches_are_masked_once() -> None:
    redactor = Redactor(extra_patterns=(r"REDACT", r"admin:\S+"))

    masked = redactor.redact_text(f"curl -u admin:{PASSWORD} https://ci.example.com")

    assert masked == f"curl -u {DEFAULT_MASK} https://ci.example.com"


def test_url_password_keeps_user_and_host() -> None:
    text = f"postgresql://onward:{PASSWORD}@db.internal:5432/onward?sslmode=require"

    masked = Redactor().redact_text(text)

    assert masked == f"postgresql://onward:{DEFAULT_MASK}@db.internal:5432/onward?sslmode=require"


def test_labelled_value_keeps_the_label_and_the_next_parameter() -> None:
    masked = Redactor().redact_text(f"/v1/search?api_key={CLIENT_SECRET}&page=2")

    assert masked == f"/v1/search?api_key={DEFAULT_MASK}&page=2"


def test_pem_block_across_lines_is_masked_whole() -> None:
    masked = Redactor().redact_text(f"before\n{RSA_BLOCK}\nafter")

    assert masked == f"before\n{DEFAULT_MASK}\nafter"


def test_truncated_pem_block_is_masked_to_the_end() -> None:
    truncated = RSA_BLOCK[: len(RSA_BLOCK) // 2]

    assert Redactor().redact_text(f"head -c 200 id_rsa:\n{truncated}") == (
        f"head -c 200 id_rsa:\n{DEFAULT_MASK}"
    )


def test_the_shortest_secret_is_masked() -> None:
    assert Redactor().redact_text("pwd=abc") == f"pwd={DEFAULT_MASK}"


def test_custom_mask() -> None:
    redactor = Redactor(mask="***")

    assert redactor.redact_text(f"Bearer {BEARER}") == "Bearer ***"


def test_masked_text_is_left_alone_when_redacted_again() -> None:
    redactor = Redactor()
    once = redactor.redact_text(f"password={PASSWORD} and {GITHUB_APP}")

    assert redactor.redact_text(once) == once
