"""An application attribute that is a plain class."""


class NotADeployment:
    def __call__(self, request):
        return "hi"
