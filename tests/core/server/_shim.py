import inspect


def adapt(backend):
    params = list(inspect.signature(backend.generate).parameters)
    if params[0] != "conversation_id":
        return backend

    class A:
        info = backend.info

        def generate(self, request, cancel):
            return backend.generate(request.conversation_id or 0, request.messages or [], request.params, cancel=cancel)

        def memory(self):
            return backend.memory()

    return A()
