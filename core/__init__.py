"""The bottom room: declarations and errors that every other room may import (no project imports)."""
