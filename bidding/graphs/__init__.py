"""AITP task graphs (seed 004 sections 2, 3 and 5.3): a task decomposed into subtasks, each
auctioned as an ordinary bidding task the moment its dependencies are done, data flowing
through ``${parent.input.x}`` / ``${subtask_id.output.y}`` templates."""
