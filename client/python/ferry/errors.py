"""ferry's exception type."""


class FerryError(RuntimeError):
    """An error from ferryd or the ferry client library.

    Attributes:
      code: the status code name ("NOT_FOUND", "UNAVAILABLE", ...), as in absl/gRPC.
      message: what went wrong and, where possible, what to do.
      code_value: the numeric code (0-16), or None when the error arose in Python.
    """

    def __init__(self, code, message, code_value=None):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.code_value = code_value
