"""The REST API's routes, one module per resource, each an `APIRouter` made for one `Service`.

`service/api.py`'s `create_app` includes them one line each; a new resource is a new module
here and one more include line there. What every route shares (the error document, the body
limit, the audit log, the 404 for an unknown job) is in `common`.
"""
