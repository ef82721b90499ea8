"""Errors that reach the client, in the vocabulary of the AWS JSON protocol.

Domain code raises these; the protocol layer turns them into `{"__type", "message"}` bodies.
The code is the botocore error-shape name, so botocore raises the matching exception class.
"""


class ApiError(Exception):
    code = "ClientException"
    status = 400

    def __init__(self, message: str, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if status:
            self.status = status


class InvalidParameter(ApiError):
    code = "InvalidParameterException"


class ClientError(ApiError):
    code = "ClientException"


class ClusterNotFound(ApiError):
    code = "ClusterNotFoundException"

    def __init__(self, message: str = "Cluster not found."):
        super().__init__(message)


class NotFound(ApiError):
    code = "ResourceNotFoundException"


class ResourceInUse(ApiError):
    code = "ResourceInUseException"


class Conflict(ApiError):
    code = "ConflictException"


class UnknownOperation(ApiError):
    code = "UnknownOperationException"


class AuthError(ApiError):
    status = 403


class ServerError(ApiError):
    code = "ServerException"
    status = 500
