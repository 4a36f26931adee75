// @runstate/langgraph is the saver of @runstate/client, under the name LangGraph.js users
// look for: one implementation (../src/langgraph.ts), two ways to import it.
export * from "@runstate/client/langgraph";
