"""SigV4 verification against requests signed by botocore itself."""

from datetime import datetime, timedelta, timezone

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from shoal.api.protocol import sigv4
from shoal.domain.errors import AuthError

SECRETS = {"AKIDSHOAL": "s3cret"}


def signed(body=b'{"clusterName":"a"}', secret="s3cret", key="AKIDSHOAL", url="http://127.0.0.1:8642/"):
    req = AWSRequest(method="POST", url=url, data=body, headers={
        "X-Amz-Target": "AmazonEC2ContainerServiceV20141113.CreateCluster",
        "Content-Type": "application/x-amz-json-1.1"})
    SigV4Auth(Credentials(key, secret), "ecs", "local").add_auth(req)
    return {k.lower(): v for k, v in req.headers.items()} | {"host": "127.0.0.1:8642"}, body


def test_a_botocore_signature_verifies_and_names_the_key():
    headers, body = signed()
    assert sigv4.verify("POST", "/", "", headers, body, SECRETS) == "AKIDSHOAL"


def test_query_strings_are_canonicalised_like_botocore():
    req = AWSRequest(method="GET", url="http://127.0.0.1:8642/v1/events?limit=5&after=0.12")
    SigV4Auth(Credentials("AKIDSHOAL", "s3cret"), "ecs", "local").add_auth(req)
    headers = {k.lower(): v for k, v in req.headers.items()} | {"host": "127.0.0.1:8642"}
    assert sigv4.verify("GET", "/v1/events", "limit=5&after=0.12", headers, b"", SECRETS) == "AKIDSHOAL"


@pytest.mark.parametrize("mutate, code", [
    (lambda h, b: (h, b + b" "), "InvalidSignatureException"),                     # body changed
    (lambda h, b: ({**h, "x-amz-target": "X.DeleteCluster"}, b), "InvalidSignatureException"),
    (lambda h, b: ({k: v for k, v in h.items() if k != "authorization"}, b), "UnrecognizedClientException"),
    (lambda h, b: ({**h, "authorization": "Bearer abc"}, b), "UnrecognizedClientException"),
    (lambda h, b: ({**h, "x-amz-date": "yesterday"}, b), "InvalidSignatureException"),
])
def test_tampered_or_missing_signatures_are_refused(mutate, code):
    headers, body = mutate(*signed())
    with pytest.raises(AuthError) as err:
        sigv4.verify("POST", "/", "", headers, body, SECRETS)
    assert err.value.code == code


def test_unknown_key_and_wrong_secret():
    with pytest.raises(AuthError) as err:
        sigv4.verify("POST", "/", "", *signed(key="AKIDOTHER"), SECRETS)
    assert err.value.code == "UnrecognizedClientException"
    with pytest.raises(AuthError) as err:
        sigv4.verify("POST", "/", "", *signed(secret="guess"), SECRETS)
    assert err.value.code == "InvalidSignatureException"


def test_signatures_older_than_15_minutes_are_expired():
    headers, body = signed()
    later = datetime.now(timezone.utc) + timedelta(minutes=16)
    with pytest.raises(AuthError, match="expired"):
        sigv4.verify("POST", "/", "", headers, body, SECRETS, now=later)
