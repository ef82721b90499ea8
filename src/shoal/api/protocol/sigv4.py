"""Verify AWS Signature Version 4 on incoming requests.

The server holds a secret per access key. We rebuild the canonical request from what arrived
(method, path, query, the headers the client says it signed, the payload hash), derive the
signing key for the credential scope the client used, and compare signatures in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime, timezone
from urllib.parse import quote

from shoal.domain.errors import AuthError

ALGORITHM = "AWS4-HMAC-SHA256"
MAX_SKEW_SECONDS = 15 * 60


def _unrecognized(message: str) -> AuthError:
    return AuthError(message, code="UnrecognizedClientException")


def _bad_signature(message: str) -> AuthError:
    return AuthError(message, code="InvalidSignatureException")


def _parse_authorization(header: str) -> dict[str, str]:
    if not header.startswith(ALGORITHM + " "):
        raise _unrecognized("Missing or unsupported Authorization header: expected AWS4-HMAC-SHA256.")
    parts = {}
    for item in header[len(ALGORITHM) + 1:].split(","):
        key, _, value = item.strip().partition("=")
        parts[key] = value
    if not {"Credential", "SignedHeaders", "Signature"} <= parts.keys():
        raise _bad_signature("Authorization header is missing Credential, SignedHeaders or Signature.")
    return parts


def _canonical_query(query: str) -> str:
    if not query:
        return ""
    pairs = []
    for item in query.split("&"):
        k, _, v = item.partition("=")
        pairs.append((quote(k, safe="-_.~%"), quote(v, safe="-_.~%")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def _signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    key = hmac.new(("AWS4" + secret).encode(), date.encode(), hashlib.sha256).digest()
    for part in (region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def verify(method: str, path: str, query: str, headers: dict[str, str], body: bytes,
           secrets: dict[str, str], now: datetime | None = None) -> str:
    """Return the access key id that signed the request, or raise AuthError.

    `headers` must have lower-case names.
    """
    auth = headers.get("authorization")
    if not auth:
        raise _unrecognized("Missing Authentication Token: the request is not signed.")
    parts = _parse_authorization(auth)
    scope = parts["Credential"].split("/")
    if len(scope) != 5 or scope[4] != "aws4_request":
        raise _bad_signature(f"Malformed credential scope '{parts['Credential']}'.")
    access_key, date, region, service, _ = scope
    secret = secrets.get(access_key)
    if secret is None:
        raise _unrecognized("The security token included in the request is invalid.")

    amz_date = headers.get("x-amz-date", "")
    try:
        signed_at = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        raise _bad_signature("Missing or malformed X-Amz-Date header.") from None
    now = now or datetime.now(timezone.utc)
    if abs((now - signed_at).total_seconds()) > MAX_SKEW_SECONDS or not amz_date.startswith(date):
        raise _bad_signature(f"Signature expired: {amz_date} is not within 15 minutes of the server time.")

    signed_headers = parts["SignedHeaders"].split(";")
    canonical_headers = "".join(
        f"{name}:{' '.join(headers.get(name, '').split())}\n" for name in signed_headers
    )
    # Always hash what arrived: a client-supplied hash (or UNSIGNED-PAYLOAD) that differs from
    # the body would let a signed request carry another body.
    payload_hash = hashlib.sha256(body).hexdigest()
    if headers.get("x-amz-content-sha256", payload_hash) != payload_hash:
        raise _bad_signature("The request signature does not cover this body: X-Amz-Content-SHA256 does not "
                             "match the SHA-256 of the request body.")
    canonical_request = "\n".join([
        method, quote(path or "/", safe="/-_.~%"), _canonical_query(query), canonical_headers,
        parts["SignedHeaders"], payload_hash,
    ])
    string_to_sign = "\n".join([
        ALGORITHM, amz_date, f"{date}/{region}/{service}/aws4_request",
        hashlib.sha256(canonical_request.encode()).hexdigest(),
    ])
    expected = hmac.new(_signing_key(secret, date, region, service), string_to_sign.encode(),
                        hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, parts["Signature"]):
        raise _bad_signature(
            "The request signature we calculated does not match the signature you provided. "
            "Check your AWS Secret Access Key and signing method."
        )
    return access_key
